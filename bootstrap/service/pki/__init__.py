"""The CA and TLS lifecycle: the CA store and its rotations, the listener's TLS context and
certificate, the names it is issued for, and the start-up checks of the CA."""
