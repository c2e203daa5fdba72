"""The hand-written script runjob replaces, for ``tiny_job.py``: the Accelerate quick-start pattern
a user writes by hand for ResNet-18 on an image folder (train/<class>/, val/<class>/), trained for
a few optimizer steps, evaluated on val and saved. No runjob import: only torch, torchvision and
accelerate, as such a script has.

    python benchmarks/handwritten_tiny.py DATA_ROOT OUTPUT_DIR [--steps 5] [--batch-size 32]

It prints a line when it starts, one after each step and one at the end, as a script does.
"""

from __future__ import annotations

import argparse
import sys
import time

STARTED = time.perf_counter()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("output_dir")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.002)
    args = parser.parse_args()
    print(f"training resnet18 on {args.root} for {args.steps} steps, output in {args.output_dir}", flush=True)

    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from torchvision import datasets, models, transforms

    set_seed(0)
    accelerator = Accelerator()
    transform = transforms.Compose(
        [
            transforms.Resize((args.image_size, args.image_size)),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    train_set = datasets.ImageFolder(f"{args.root}/train", transform)
    val_set = datasets.ImageFolder(f"{args.root}/val", transform)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=args.batch_size)
    model = models.resnet18(num_classes=len(train_set.classes))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, train_loader, val_loader)

    model.train()
    step = 0
    while step < args.steps:
        for images, labels in train_loader:
            loss = F.cross_entropy(model(images), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            print(f"step {step} loss {loss.item():.4f} ({time.perf_counter() - STARTED:.2f} s)", flush=True)
            if step == args.steps:
                break

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in val_loader:
            predictions = accelerator.gather_for_metrics(model(images).argmax(dim=1))
            labels = accelerator.gather_for_metrics(labels)
            correct += (predictions == labels).sum().item()
            total += labels.numel()
    print(f"val accuracy {correct / total:.4f}", flush=True)
    accelerator.wait_for_everyone()
    accelerator.save_model(model, args.output_dir)
    print(f"saved {args.output_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
