"""Worker runtime and SDK; result stores."""
