"""The measurement harness: one timing protocol (``timing``), background monitors
(``monitors``), cached-batch replay (``replay``) and the runner that ties a pipeline, a
mode and the results store together (``runner``). It never knows which pipeline it times.
"""
