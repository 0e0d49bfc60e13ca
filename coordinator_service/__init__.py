"""The transaction coordinator and metadata authority of an EOS cluster."""
