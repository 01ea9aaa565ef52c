"""Tuning kernel configurations on a GPU (`epic tune`); what won goes to the tuning database
(epic/runtime/tuning_db.py, which every call consults).

  space.py     the legal configurations of one gemm at given sizes, ranked by a cost model
  inputs.py    the random inputs on the GPU every candidate is timed on
  measure.py   timing a call on the GPU (L2 flushed, CUDA events, median)
  trial.py     one candidate timed in a child process (a hanging kernel is killed, not waited for)
  tuner.py     the search: build every candidate in parallel, time each, keep the winners
  report.py    `epic plan --tuned`: what the database holds for a program, per GPU
"""
