"""Persistence: the app's folder, settings, installs, chat history, keychain."""
