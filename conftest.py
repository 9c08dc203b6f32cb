# Doctests are collected from the packages too; running the CLI entry point is not a test.
collect_ignore = ["dpnode/node/__main__.py"]
