"""TFLite models read without the interpreter: the graph as data (`graph`), run in torch (`torch_module`).

`torch_module` imports torch, an optional dependency (extra ``gpu``); import it only where torch is wanted.
"""
