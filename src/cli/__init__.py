"""The ``chronolog`` command line: every entry point, its shared flags and its output.

``chronolog.cli.main`` assembles the sub-commands; each module here registers its own.
"""
