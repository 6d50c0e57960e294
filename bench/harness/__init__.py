"""The measurement harness: one timing protocol, background monitors, cached-batch replay and the runner
that ties a pipeline, a mode and the results together. It never knows which pipeline it times."""
