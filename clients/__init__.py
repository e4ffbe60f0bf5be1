"""What runs in other processes: the sample publisher, (later) weight subscriber and prediction client."""
