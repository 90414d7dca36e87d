"""The libp2p peer layer: signed gossip announcements over py-libp2p gossipsub (Noise only).

``announcements`` holds the pure rules (topics, signing, what a node accepts), ``node`` the
libp2p host running in a trio thread, ``gossip`` the two joined behind a small interface that
asyncio and sync programs use, and ``config`` the ``[p2p]`` config section.
"""
