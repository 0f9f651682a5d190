"""What every part of the site may use without reaching into the protocol app: the configuration."""
