"""How far two fp32 trainings of mlp-small drift apart when only the summation order differs:
PyTorch on the CPU against PyTorch on the GPU, same weights and batches, Adam as the runtime's.
The reference for what `shardplan run --backend cuda --compare-reference` may show (see
docs/gpu-results.md). Prints, per step count, ‖W_gpu − W_cpu‖ / ‖W_cpu − W_0‖ (worst layer) and
the loss's relative difference.

    python3 scripts/adam-divergence.py
"""

import torch

WIDTHS = [256, 512, 512, 512, 512, 64]
BATCH, LR, STEPS = 64, 1e-3, 16


def model(device, state=None):
    layers = []
    for k in range(len(WIDTHS) - 1):
        layers.append(torch.nn.Linear(WIDTHS[k], WIDTHS[k + 1]))
        if k + 2 < len(WIDTHS):
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers)
    if state is not None:
        net.load_state_dict(state)
    return net.to(device)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(7)
    initial = model("cpu").state_dict()
    initial = {k: v.clone() for k, v in initial.items()}
    teacher = torch.rand(WIDTHS[-1], WIDTHS[0]) * 2 - 1
    batches = []
    for _ in range(STEPS):
        x = torch.rand(BATCH, WIDTHS[0]) * 2 - 1
        batches.append((x, torch.tanh(x @ teacher.T / WIDTHS[0] ** 0.5)))
    runs = {}
    for device in ["cpu", "cuda"]:
        net = model(device, initial)
        opt = torch.optim.Adam(net.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8)
        states, losses = [], []
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(net(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            states.append({k: v.detach().cpu().clone() for k, v in net.state_dict().items()})
        runs[device] = (states, losses)
    print("steps  update_relative_error  loss_relative_error")
    for step in [1, 2, 4, 8, 16]:
        cpu, gpu = runs["cpu"][0][step - 1], runs["cuda"][0][step - 1]
        worst = max(
            ((gpu[k] - cpu[k]).norm() / (cpu[k] - initial[k]).norm().clamp_min(1e-30)).item()
            for k in cpu
        )
        loss = max(
            abs(a - b) / abs(b) for a, b in zip(runs["cuda"][1][:step], runs["cpu"][1][:step])
        )
        print(f"{step:5d}  {worst:21.3e}  {loss:19.3e}")


if __name__ == "__main__":
    main()
