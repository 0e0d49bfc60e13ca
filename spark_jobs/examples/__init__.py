"""Sample pipelines shipped with the Spark jobs."""
