"""The asyncio twins of the SDK's clients: same names with ``Async`` in front, same
behaviour, every call that does I/O awaited.

Example::

    from sdk.aio import AsyncTransactionalProducer

    producer = AsyncTransactionalProducer("http://127.0.0.1:8080", "enricher-0")
    await producer.init_transactions()
    async with producer.transaction():
        await producer.send("enriched", "order-1+")
    await producer.close()
"""

from sdk.aio.admin import AsyncAdminClient
from sdk.aio.consumer import AsyncConsumer
from sdk.aio.producer import AsyncProducer, AsyncTransactionalProducer

__all__ = ["AsyncAdminClient", "AsyncConsumer", "AsyncProducer", "AsyncTransactionalProducer"]
