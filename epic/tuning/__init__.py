"""Tuning kernel configurations on a GPU (`epic tune`), and the database of what won.

  space.py     the legal configurations of one gemm at given sizes, ranked by a cost model
  database.py  the tuning database: a JSON file keyed by program, GPU, shape bucket and versions,
               which epic.compile consults on every new signature
  measure.py   timing a call on the GPU (L2 flushed, CUDA events, median)
  tuner.py     the search: build every candidate in parallel, time each, keep the winners
"""
