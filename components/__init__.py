"""The pipeline's steps and the programs their pods run (README "Layout")."""

import atexit
import gc

# Every process that imports this package (each KFP step, the trainer's ranks, the data command line) loads torch,
# transformers or datasets: millions of objects. At exit CPython walks all of them in its last garbage collections,
# 1-3 s per process on 2 CPU cores, which a run pays once per step and rank. Freezing them at exit skips that walk
# (frozen objects are never collected); the operating system frees the memory. Every atexit handler still runs
# (logging, TensorBoard and MLflow writers flush and close there), and everything the program closes itself is
# closed: what goes uncollected is only the garbage left in reference cycles, whose finalizers CPython does not
# promise to run at exit either.
atexit.register(gc.freeze)
