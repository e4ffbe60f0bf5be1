"""Code for other processes: the sample publisher, weight subscriber and prediction client."""
