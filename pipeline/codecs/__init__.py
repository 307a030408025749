"""Where each array's chunks are decoded and encoded, and the GPU's half of it: the client's choice
per array, the checks of stored frames, reading and writing chunk files directly, and nvCOMP."""
