"""The curator role: a thin I/O shell over mechanism/ (service, client, CLI, storage)."""
