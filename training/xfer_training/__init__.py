"""Training, export and evaluation of xfer's learned stream-count policy."""
