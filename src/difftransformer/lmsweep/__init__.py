"""The pre-registered language-model sweep (``difftransformer lm-sweep``; PROTOCOL.md): the paper's Figure 3 and
Table 5 and the DIFF V2 article's loss and stability claims, with an lr grid per variant and width and paired seeds."""
