"""Backends: one folder each (``cpu``, ``cuda``, ``vulkan``, ``wgpu``, ``rocm``), holding its
code generator and its device runtime, plus ``gpu`` (the gpu-dialect kernel plan the GPU
backends share), :mod:`.registry` (the one table that names them) and :mod:`.pass_pipelines`
(MLIR pass-pipeline pieces they share). Nothing is imported eagerly: a GPU machine runs a
device runtime without MLIR installed.
"""
