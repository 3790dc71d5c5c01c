"""The online data flywheel: served traffic -> verified tasks -> training -> gate -> deploy (docs/flywheel.md)."""
