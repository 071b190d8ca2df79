"""Getting configuration to nodes: config document push, rolling upgrades, release purges."""
