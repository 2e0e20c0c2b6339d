"""The REST server for the model repository (lands with the serve issue)."""
