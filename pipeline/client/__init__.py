"""What runs in the client, the process that calls ``batchlu.run``: the run's sequence (check the
inputs, create or reopen the output, plan the tasks), their submission to the cluster with the
workers' warm-up, the progress bar, and the report."""
