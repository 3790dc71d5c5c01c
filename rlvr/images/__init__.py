"""Environment images: a task's own interpreter and packages, built once and run read-only.

``spec`` declares an image (interpreter, hashed lock, files, setup) and its content key; ``build``
makes it with ``uv`` into the cache; ``cache`` finds, verifies, lists and collects images. A task
names its image in its spec payload (``image: NAME``); the sandbox runs that task's code on the
image's interpreter, with only that image readable (``rlvr.sandbox``). ``docs/images.md`` has the
how-to.
"""
