"""Registered trainers with their own step loops (see :mod:`senslab.train.trainers`); each module
registers one trainer and writes its run directory through :class:`senslab.train.looprun.LoopRun`.
"""
