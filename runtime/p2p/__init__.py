"""The libp2p peer layer: signed gossip announcements over py-libp2p gossipsub (Noise only).

The pure rules (topics, signing, what a node accepts) are the wire's, in :mod:`protocol.announcements`;
here ``host`` is the libp2p host running in a trio thread, ``gossip`` joins the two behind a small
interface that asyncio and sync programs use, and ``config`` is the ``[p2p]`` config section.
"""
