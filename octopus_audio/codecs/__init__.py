"""The key codecs (none, turboquant-mse, turboquant-qjl, polarquant, octopus, octopus-qjl) and their states."""
