"""The language-model side of attnid (chapters 6 and 7, the paper's §5).

``data`` (tiny Shakespeare), ``gpt`` (the nanoGPT model), ``profiles`` (run configs and suites), ``train``
(the loop), ``batched`` (runs trained as one stacked model), ``probe`` (what one optimizer step does to the
QK symmetry), ``metrics`` (the row keys), ``records`` (run records), ``analysis`` (suites and per-run
numbers), ``claims`` (the §5 claims), ``ablation`` (head importance and pruning) and ``launch`` (suites
through submitit). It builds on the math in :mod:`attnid`; the math never imports it.
"""
