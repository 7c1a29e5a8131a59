"""``png`` (lossless), ``jpeg`` and ``webp`` (lossy): image codecs through OpenCV.

An array of shape ``(H, W)``, ``(H, W, 1)`` or ``(H, W, 3)`` is encoded as the image it is (3
channels in the order given: OpenCV calls it BGR and gives the same order back, so a round trip keeps
RGB as RGB; JPEG's chroma subsampling then treats R as B, which changes its errors slightly, not its
kind). PNG also takes any other layout, encoded losslessly as a 2-D grey image of
``shape[0]`` rows (for a frame stack ``(84, 84, 4)``: 84 x 336); JPEG and WebP take only what they
can encode as an image, and say so otherwise. PNG takes uint8 and uint16; JPEG and WebP uint8.
OpenCV releases the GIL while it encodes and decodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shmvec.codecs.base import Codec, CodecError, nbytes, out_bytes


class ImageCodec(Codec):
    """Common path of the OpenCV codecs: shape to image layout, ``imencode``/``imdecode``."""

    releases_gil = True
    extension = ""
    dtypes: tuple[str, ...] = ("uint8",)
    #: whether layouts other than (H, W[, 1|3]) may be encoded as a 2-D grey image.
    any_layout = False

    def _image_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) == 2 or (len(shape) == 3 and shape[2] in (1, 3)):
            return shape[:2] if len(shape) == 3 and shape[2] == 1 else shape
        if not self.any_layout:
            raise CodecError(
                f"{self.name} encodes images of shape (H, W), (H, W, 1) or (H, W, 3), not {shape}; "
                "use png or a byte codec (lz4, zstd, delta) for other layouts"
            )
        if len(shape) == 0:
            return (1, 1)
        if len(shape) == 1:
            return (1, shape[0])
        return (shape[0], int(np.prod(shape[1:], dtype=np.int64)))

    def check(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Refuse dtypes the format cannot hold and images with a side longer than ``max_side`` pixels.

        :raises CodecError: naming the shape or dtype.
        """
        if np.dtype(dtype).name not in self.dtypes:
            raise CodecError(
                f"{self.name} cannot encode {np.dtype(dtype).name} arrays (only {', '.join(self.dtypes)}); "
                "use a byte codec (lz4, zstd, delta), which takes any dtype"
            )
        image = self._image_shape(shape)
        if min(image) < 1 or max(image) > self.max_side:
            raise CodecError(f"{self.name} cannot encode an image of {image[0]} x {image[1]} pixels")

    max_side = 65500

    def flags(self) -> list[int]:
        """OpenCV ``imencode`` parameters."""
        return []

    def encode(self, arr: np.ndarray, out: np.ndarray, stream: Any = None) -> int:
        """Encode the image with OpenCV into ``out``; return the number of bytes written."""
        import cv2

        self.check(arr.shape, arr.dtype)
        image = np.ascontiguousarray(arr).reshape(self._image_shape(arr.shape))
        ok, packed = cv2.imencode(self.extension, image, self.flags())
        if not ok:
            raise CodecError(f"{self.name}: OpenCV could not encode a {arr.shape} {arr.dtype} array")
        if packed.size > out.size:
            raise CodecError(f"{self.name}: {packed.size} bytes do not fit the {out.size}-byte buffer")
        out[: packed.size] = packed.reshape(-1)
        return int(packed.size)

    def decode(self, data: np.ndarray, out: np.ndarray, stream: Any = None) -> np.ndarray:
        """Decode an image OpenCV encoded into ``out``; return ``out``."""
        import cv2

        image = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
        if image is None or image.size != out.size or image.dtype != out.dtype:
            raise CodecError(
                f"{self.name}: corrupt data (does not decode to a {out.shape} {out.dtype} image)"
            )
        out_bytes(out)[:] = image.reshape(-1).view(np.uint8)
        return out


class PNGCodec(ImageCodec):
    """Lossless PNG (deflate with per-row prediction); uint8 and uint16, any layout.

    :param level: zlib compression level 0-9 (default 1: the fastest that compresses).
    """

    name = "png"
    lossless = True
    extension = ".png"
    dtypes = ("uint8", "uint16")
    any_layout = True
    max_side = 2**31 - 1

    def __init__(self, level: int = 1) -> None:
        if not 0 <= level <= 9:
            raise ValueError(f"png level must be between 0 and 9, got {level}")
        self.level = int(level)

    def params(self) -> dict[str, Any]:
        """``{"level": ...}``: PNG's zlib compression level."""
        return {"level": self.level}

    def flags(self) -> list[int]:
        """OpenCV ``imencode`` flags for this level."""
        import cv2

        return [cv2.IMWRITE_PNG_COMPRESSION, self.level]

    def max_encoded_size(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """Worst-case PNG size in bytes: the raw pixels plus zlib's and PNG's overhead."""
        # Stored deflate blocks (5 bytes per 16 KiB at worst), one filter byte per row, chunk headers.
        rows = self._image_shape(shape)[0]
        n = nbytes(shape, dtype)
        return n + rows + n // 1024 + 4096


class JPEGCodec(ImageCodec):
    """Lossy JPEG; uint8 images only.

    :param quality: 0-100 (default 90); below ~50 block artifacts are plain to see.
    """

    name = "jpeg"
    lossless = False
    extension = ".jpg"

    def __init__(self, quality: int = 90) -> None:
        if not 0 <= quality <= 100:
            raise ValueError(f"jpeg quality must be between 0 and 100, got {quality}")
        self.quality = int(quality)

    def params(self) -> dict[str, Any]:
        """``{"quality": ...}``: JPEG quality, 0-100."""
        return {"quality": self.quality}

    def flags(self) -> list[int]:
        """OpenCV ``imencode`` flags for this quality."""
        import cv2

        return [cv2.IMWRITE_JPEG_QUALITY, self.quality]

    def max_encoded_size(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """Worst-case JPEG size in bytes (generous: JPEG can exceed the raw size at high quality)."""
        # libjpeg-turbo's tjBufSize: 16x16-padded image, 6 bytes per pixel at worst, plus headers.
        h, w = self._image_shape(shape)[:2]
        return ((w + 15) // 16 * 16) * ((h + 15) // 16 * 16) * 6 + 2048


class WebPCodec(ImageCodec):
    """WebP; uint8 images. Lossy at quality 1-100, lossless at quality 101 (OpenCV's convention).

    :param quality: 1-101 (default 90).
    """

    name = "webp"
    extension = ".webp"
    max_side = 16383

    def __init__(self, quality: int = 90) -> None:
        if not 1 <= quality <= 101:
            raise ValueError(f"webp quality must be between 1 and 101 (101 = lossless), got {quality}")
        self.quality = int(quality)
        self.lossless = self.quality > 100

    def params(self) -> dict[str, Any]:
        """``{"quality": ...}``: WebP quality, 1-100, or 101 for lossless."""
        return {"quality": self.quality}

    def flags(self) -> list[int]:
        """OpenCV ``imencode`` flags for this quality."""
        import cv2

        return [cv2.IMWRITE_WEBP_QUALITY, self.quality]

    def check(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """As :meth:`ImageCodec.check`, and only ``(H, W, 3)`` images (OpenCV decodes grey as 3 channels).

        :raises CodecError: naming the shape or dtype.
        """
        super().check(shape, dtype)
        if len(shape) != 3 or shape[2] != 3:
            # OpenCV stores grey WebP as 3 channels and would decode a different shape.
            raise CodecError(f"webp encodes (H, W, 3) images only, not {shape}")

    def max_encoded_size(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """Worst-case WebP size in bytes (generous, as for JPEG)."""
        return 2 * nbytes(shape, dtype) + 4096


def webp_available() -> bool:
    """True if this OpenCV build can encode WebP."""
    try:
        import cv2

        return bool(cv2.haveImageWriter(".webp"))
    except Exception:
        return False
