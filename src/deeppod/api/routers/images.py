from dataclasses import asdict

from fastapi import APIRouter, Request

from deeppod.api.deps import PrincipalDep, get_ctx
from deeppod.api.schemas.images import ImageOut
from deeppod.envs import service

router = APIRouter(prefix="/v1/images", tags=["images"])


@router.get("", response_model=list[ImageOut])
def list_images(request: Request, principal: PrincipalDep) -> list[ImageOut]:
    """The container images jobs may run in (``--image NAME``): what the administrator put in
    DEEPPOD_IMAGE_DIR."""
    settings = get_ctx(request).settings
    return [ImageOut(**asdict(i)) for i in service.list_images(settings.envs_root, settings.image_dir)]
