"""What stands above both studies: the documentation generated from their committed results (``docs.py``).

It may import both studies (``retrieval/``, ``lmsweep/``) and what they share (``studies/``); nothing imports it but
the command line and ``make docs``.
"""
