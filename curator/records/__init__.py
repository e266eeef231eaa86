"""The files a curator keeps: its keystore (pads, samples, agreements), its privacy ledger, the
ledger head signed with its certificate key and the server's witness of it. Imports nothing of
the curator but ``errors`` and ``waits``."""
