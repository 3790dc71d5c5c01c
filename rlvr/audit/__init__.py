"""Reward audits: scripted hacking policies (``hacks``) run against every domain and verifier
through the training reward path (``rewards``); ``rlvr audit rewards`` prints the table."""
