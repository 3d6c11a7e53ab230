"""Local launching: `caramel run`, the worker entrypoint, the rendezvous and process handling."""
