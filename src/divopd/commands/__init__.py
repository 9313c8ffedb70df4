"""One small module per CLI verb: parse flags, call the library, print. ``divopd.cli`` dispatches to them."""
