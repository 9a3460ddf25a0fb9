"""fsbench: dxfs side by side with kernel ext4, XFS, btrfs and fuse2fs (see bench/README.md)."""
