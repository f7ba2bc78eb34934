"""The spec's Appendix A values, verbatim, and the folder of test vectors."""

from __future__ import annotations

from pathlib import Path

VECTORS = Path(__file__).resolve().parent.parent / "vectors"
# Appendix A, verbatim.
APPENDIX_A_COMPAT_ID = "5ed5c2f238839655d7c4029e12b7f31caf9e7421f4edb4057feee6dab760ee0f"
APPENDIX_A_SCOPE_KEY = bytes(range(32))
APPENDIX_A_TOKENS = [128000, 791, 6460, 374, 264, 1296, 315, 279]
APPENDIX_A_SCOPE_ID = "6d1c6481cd428737da312c089db3832a"
APPENDIX_A_K0 = "9ca9d8b60f37f84726a27deb4cdc0d075714607a131632c2366e30b99fb1163b"
APPENDIX_A_K1 = "653275884ca44f8945fd4c902611c467394b73656e64c78d8522648cb75aefc1"
