"""The `epic` command-line front end."""
