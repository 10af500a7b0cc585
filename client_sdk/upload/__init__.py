"""The device's upload path: the uploader and its token wallet."""
