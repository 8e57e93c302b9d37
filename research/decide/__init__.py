"""qk-decide: the project's decisions for anyone's runs (docs/decide.md)."""
