"""Where the tasks run and on what: connecting to a cluster or starting the embedded one (CPU or one
worker per GPU, TLS, logs to a file, the script guard), and the backend a run computes on, decided
in one place from the GPUs there are. Nothing here knows the work that will run on the cluster."""
