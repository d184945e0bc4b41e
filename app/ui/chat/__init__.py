"""The chat pane: transcript, composer, conversation list."""
