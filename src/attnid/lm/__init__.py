"""The language-model side of attnid (chapters 6 and 7, the paper's §5).

``data`` (tiny Shakespeare), ``gpt`` (the nanoGPT model), ``profiles`` (run configs), ``train`` (the loop),
``probe`` (what one optimizer step does to the QK symmetry), ``records`` (run records) and ``ablation``
(head importance and pruning). It builds on the math in :mod:`attnid`; the math never imports it.
"""
