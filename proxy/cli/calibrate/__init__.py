"""``coherence-guard calibrate``: where a model starts to degenerate, and what prevents it.

:mod:`~proxy.cli.calibrate.run` drives the matrix of prompts and settings against the engine,
:mod:`~proxy.cli.calibrate.stream` reads one answer, :mod:`~proxy.cli.calibrate.stats` turns
answers into survival curves and recommendations, :mod:`~proxy.cli.calibrate.report` writes them.
"""
