"""Imported by the fork server before anything else it preloads (`runner.PRELOAD`), and by
nothing else: the server is SIGKILLed the moment the search that started it dies.

Left to notice its "alive" pipe closing, the server would run the interpreter's shutdown with
torch and transformers loaded (several seconds here), and its workers die only after it.
"""

from autotune.processes import die_with_parent

die_with_parent()
