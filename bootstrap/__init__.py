"""The join service, the hold gate and the node-side client."""
