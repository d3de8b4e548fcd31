"""Storage backends. Import them from their modules; Redis and MongoDB need their extras."""
