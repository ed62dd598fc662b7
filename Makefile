# attnid: `make book` builds the companion book, `make test` runs the tests (`make test-book`: the book's tests).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PROFILE ?= cpu
DEVICE ?= auto
JOBS ?= 1
PY := $(VENV)/bin/python
# glibc's allocator keeps freed blocks up to 256 MB in the process instead of handing each large tensor back to the
# kernel and faulting its pages in again: Jacobians and training allocate the same sizes over and over. Measured on
# 2 cores: chapter 8 at smoke 31 -> 26 CPU-s (system time 6.7 -> 2.4 s), peak memory +18 %; make test's system time
# 136 -> 79 s. Inherited by every process the targets start (kernels, commands); other C libraries ignore it.
export MALLOC_MMAP_THRESHOLD_ ?= 268435456
export MALLOC_TRIM_THRESHOLD_ ?= 268435456
STAMP := $(VENV)/.installed
# Python's default: a module compiled once is cached beside it (in the venv, in src/), not compiled again by every
# test worker and kernel
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help venv test test-book test-fast lint format bench bench-gpu bench-count paper-records data book chapter serve clean

help:
	@echo "make book     execute every chapter (PROFILE=$(PROFILE), DEVICE=$(DEVICE), JOBS=$(JOBS) at once) and build the HTML book"
	@echo "make test     run the tests of the package, its commands and its training (all but the book's)"
	@echo "make test-book   the book's tests: the smoke book built and its pages in Chromium, chapters run elsewhere"
	@echo "make test-fast   every test but the slow ones (real presets, processes) and the book's"
	@echo "make lint     ruff check, ruff format --check and mypy on src/ (configured in pyproject.toml)"
	@echo "make format   apply ruff's fixes and formatting"
	@echo "make chapter NB=notebooks/03_biases.py   re-execute one chapter and rebuild"
	@echo "make serve    serve the built book on http://127.0.0.1:8000"
	@echo "make bench    audit timing ladder and training throughput (needs the corpus)"
	@echo "make bench-gpu   the GPU training path: stacked runs, probe, evaluation, projected suite times"
	@echo "make bench-count the counter: attnid count's wall time here and in a fresh core install, its size, and the"
	@echo "                 book's counter page in Chromium (cold and warm), once the book is built"
	@echo "make paper-records MINUTES=9   on one GPU: the paper-scale records that fit in that time"
	@echo "make data     locate (or download) and verify the corpus"
	@echo "make venv     create .venv and install the project (run by every other target)"
	@echo "make clean    remove build/ (executed notebooks and HTML)"

# torch comes from pip (TORCH_SPEC: the CPU wheel this machine keeps on disk, or the options a user gives, such as
# an --index-url, for torch alone); the rest from uv, which resolves and installs in parallel and keeps the torch
# already there. Nothing is byte-compiled up front: each module is compiled the first time a process imports it
# and cached in the venv (PYTHONDONTWRITEBYTECODE is unexported above), so the ~16,000 files of the extras that
# nothing imports (most of transformers' 400 model families, sympy) cost nothing. `make venv` from a fresh clone
# on 2 quiet cores, one after the other: 71 s (pip, then compileall) -> 16 s. uv reads its index from UV_DEFAULT_INDEX
# (or UV_INDEX_URL), not from pip's configuration.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ -n "$(TORCH_SPEC)" ]; then $(PY) -m pip install -q --no-compile $(TORCH_SPEC); fi
	$(PY) -m pip install -q --no-compile "uv>=0.5"
	$(VENV)/bin/uv pip install -q --python $(PY) -e ".[book,test]"
	touch $(STAMP)

venv: $(STAMP)

# one worker more than the cores: part of the suite waits (kernels starting, a browser loading pages, commands
# in their own process), and the extra worker keeps the cores busy meanwhile (2 cores: 350 s against 418 s with
# one worker per core). A test file per worker: a file's fixtures (trained runs, the smoke book) are made once;
# the files go in collection order, the smoke book's first (tests/conftest.py)
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

test: $(STAMP)
	$(PYTEST) -m "not book"

# the book's tests: every chapter executed at profile smoke and the book built strictly (every page opened in
# Chromium, the counter page and the site's links checked), a chapter run outside the checkout and in a fresh
# environment with Jupyter only, the book tool's kernels, stops and page check
test-book: $(STAMP)
	$(PYTEST) -m book

test-fast: $(STAMP)
	$(PYTEST) -m "not slow and not book"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP)
	$(PY) tools/bench.py

# the counter page too, when the book has been built (make book)
bench-count: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) tools/bench_count.py --install \
		$(if $(wildcard $(BOOK_OUT)/_build/html/counter.html),--browser $(BOOK_OUT)/_build/html)

bench-gpu: $(STAMP)
	mkdir -p build
	$(PY) tools/bench.py --gpu --json build/bench-gpu.json

MINUTES ?= 9
paper-records: $(STAMP) data
	mkdir -p build
	$(PY) tools/paper_records.py --minutes $(MINUTES) --pack build/paper-records.tar.gz

clean:
	rm -rf build

# ------------------------------------------------------------------------- the book
BOOK_OUT ?= build/$(PROFILE)
BOOK := $(PY) tools/book.py --profile $(PROFILE) --device $(DEVICE) --out $(BOOK_OUT) --jobs $(JOBS)

data: $(STAMP)
	$(VENV)/bin/attnid data

book: $(STAMP) data
	$(BOOK) build

chapter: $(STAMP)
	@test -n "$(NB)" || (echo "usage: make chapter NB=notebooks/03_biases.py" && exit 2)
	$(BOOK) build $(NB)

serve:
	$(PY) tools/book.py serve --out $(BOOK_OUT)
