"""The paper's findings, reproduced: one function per finding (``secure-release reproduce``)."""
