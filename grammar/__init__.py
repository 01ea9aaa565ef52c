"""The .lark grammar of the .epi language (shipped as package data)."""
