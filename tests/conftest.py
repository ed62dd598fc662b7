"""Shared test setup. No global dtype: each test states float64 where the math needs it, and the
model and training tests run in float32, as the book does."""
