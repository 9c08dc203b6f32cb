# Doctests are collected from the packages too; running the CLI entry point is not a test.
collect_ignore = ["node/__main__.py"]
