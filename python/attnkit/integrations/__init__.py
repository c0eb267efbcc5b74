"""attnkit inside other frameworks: ``attnkit.integrations.transformers`` (Hugging Face transformers)."""
