"""The ``/v1`` routes, one module per resource (thin handlers over the gateway's modules)."""

from __future__ import annotations

from fastapi import APIRouter

from llmbatch.gateway.routes import batches, files, models

ROUTERS: tuple[APIRouter, ...] = (files.router, batches.router, models.router)
