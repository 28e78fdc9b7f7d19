"""Protocol v1: the wire (codec, messages, job map, errors, scheduler<->runner records; all
pure), then the client side (endpoints, DEALER, clients)."""
